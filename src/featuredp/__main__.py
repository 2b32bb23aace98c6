import sys

from featuredp.cli import main

sys.exit(main())
