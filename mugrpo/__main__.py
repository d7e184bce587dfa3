"""``python -m mugrpo``: the ``mugrpo`` command line (the same as the ``mugrpo`` console script)."""

from mugrpo.cli import main

if __name__ == "__main__":
    main()
