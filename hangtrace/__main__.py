import sys
from hangtrace.cli import main

sys.exit(main())
