"""``python -m local_engine``: serve the engine over HTTP (see local_engine.server)."""

import sys

from local_engine.server import main

sys.exit(main())
