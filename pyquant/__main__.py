"""python -m pyquant: see pyquant/cli.py."""
import sys

from .cli import main

sys.exit(main())
