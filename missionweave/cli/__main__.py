import sys

from missionweave.cli.app import main

sys.exit(main())
