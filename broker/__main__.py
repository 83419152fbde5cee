"""``python -m broker ...`` is the ``sluice`` command."""

import sys

from broker.cli import main

sys.exit(main())
