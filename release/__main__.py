"""`python -m release`, what `./dev release` runs (release.build)."""

import sys

from release.build import main

sys.exit(main())
