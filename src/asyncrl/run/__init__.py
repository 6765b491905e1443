"""What belongs to a run as a whole rather than to one role: the layout of its directories
(`layout.py`), which every role, the launchers and the tools that read a finished run share."""
