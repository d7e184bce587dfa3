"""A committed run read back: the HTML run report and the re-hash of its files."""
