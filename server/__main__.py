"""`python -m server serve|transcribe …`; the `whisper-server` console script calls the same `main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
