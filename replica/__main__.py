import sys

from kvemu.replica_cmd import main

sys.exit(main())
