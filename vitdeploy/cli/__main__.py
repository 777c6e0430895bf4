"""``python -m vitdeploy.cli``: the command line, as the ``vitdeploy`` console script."""

from . import main

if __name__ == "__main__":
    main()
