"""`python -m minbert`: the command line, where the package is on PYTHONPATH but not installed."""

from minbert.cli import app

app(prog_name="minbert")
