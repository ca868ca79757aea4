"""``agentrl view``: a local web viewer for runs and evaluations.

``agentrl view PATH`` serves, on loopback by default, a page over what ``train.py`` and
``agentrl eval`` wrote: a run's curves, its rollouts' episodes in sortable, filterable tables,
one episode's conversation next to the exact token stream that was trained (loss mask,
log-probabilities, weight versions, turn boundaries), the grader's findings and the sandbox's
command log; an evaluation's pass@k and episodes. It reads the files as they grow, so a run
can be watched while it trains. :mod:`agentrl.view.catalog` reads the files,
:mod:`agentrl.view.server` serves them, ``static/`` is the page (plain JavaScript, no build step,
no library).
"""

from agentrl.view.catalog import Catalog, ViewError
from agentrl.view.server import make_app, serve

__all__ = ["Catalog", "ViewError", "make_app", "serve"]
