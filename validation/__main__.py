"""``python -m validation``: run the validation suite and write the report."""

from validation.run import main

if __name__ == "__main__":
    main()
