"""The ``spdrank`` command line: :mod:`.cli` builds it from one module per sub-command, each
imported only when run, plus the flags and ranker names several commands share.

The top layer: anything below may be imported here, nothing here is imported below.
"""
