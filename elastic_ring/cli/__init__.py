"""The ``elastic-ring`` command line."""
