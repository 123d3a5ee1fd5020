"""`python -m mxlab.cli`: the command line, for machines where the `mxlab` script is not on PATH."""

from mxlab.cli import app

app()
