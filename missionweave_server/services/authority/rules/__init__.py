"""Decision rules of the Group Authority, one module per command family."""
