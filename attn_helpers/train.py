"""Alias: ``python -m attn_helpers.train ...`` is ``python -m attn_helpers train ...``."""

if __name__ == "__main__":
    import sys

    from attn_helpers.__main__ import train_main

    sys.exit(train_main(sys.argv[1:]))
