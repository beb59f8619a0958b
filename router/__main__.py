import sys

from router.cmd import main

sys.exit(main())
