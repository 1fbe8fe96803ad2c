"""`python -m server serve|transcribe …`; the `whisper-server` console script calls the same `main`."""

import sys

from .openmp import set_spin_default

set_spin_default()  # before .cli imports torch: libgomp reads it when it loads

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
