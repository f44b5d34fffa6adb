"""A multilingual corpus from the manual pages and kernel documentation this machine holds (bertdist.data.manpages):

python scripts/multilingual_corpus.py --output runs/multilingual [--languages de fr ja] [--max-docs-per-language N]
"""

import sys

from bertdist.data.manpages import main

if __name__ == "__main__":
    sys.exit(main())
