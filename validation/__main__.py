"""``python -m validation``: run the validation suite and write the report; the exit
status is non-zero when a check failed."""

import sys

from validation.run import main

if __name__ == "__main__":
    sys.exit(main())
