"""`python -m proxy` is the `taotrace` command."""

import sys

from proxy.cli import main

sys.exit(main())
