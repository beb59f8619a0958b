import sys

from kvemu.cli import main

sys.exit(main())
