import sys

from replica.cmd import main

sys.exit(main())
