"""``python -m app``: start the Kiln web UI (same flags as ``kiln serve``)."""

import sys

from app.web.server.launch import main

if __name__ == "__main__":
    sys.exit(main())
