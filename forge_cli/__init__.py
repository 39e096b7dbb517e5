"""The `forge` command line: parse, call the libraries, print. No business logic lives here."""
