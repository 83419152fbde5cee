"""``python -m bench.peers``: runs the comparison (``bench.peers.cli``)."""

import sys

from bench.peers.cli import main

if __name__ == "__main__":  # not when a spawned latency consumer imports this module as __mp_main__
    sys.exit(main())
