"""Jobs: processes with a CLI entry point (``python -m mugrpo.jobs.NAME SPEC``) that talk only through storage."""
