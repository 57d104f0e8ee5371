"""``python -m hora`` runs the ``hora`` command line."""

import sys

from hora.cli import main

if __name__ == "__main__":
    sys.exit(main())
