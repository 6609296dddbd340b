"""``python -m streamtree``: the ``streamtree`` command."""

import sys

from streamtree.cli import main

sys.exit(main())
