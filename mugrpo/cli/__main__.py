"""``python -m mugrpo.cli``: the ``mugrpo`` command line (as ``python -m mugrpo``)."""

from mugrpo.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
