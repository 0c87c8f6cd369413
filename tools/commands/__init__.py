"""The commands of the ``kvcontract`` command line, one module each.

Each module holds one click command: its options, their validation, the call into
its engine and the output. :mod:`kvcontract.tools.cli` registers them on the group;
:mod:`._common` holds what several commands share (``--format``/``--output``, the
verdict table).
"""
