import sys

from phoenix.cli import main

sys.exit(main())
