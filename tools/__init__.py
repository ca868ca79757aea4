"""agentrl's built-in tools (installed as the ``agentrl_tools`` package).

The repository folder is ``tools/``; it is installed under the distinct import name
``agentrl_tools`` so it can neither shadow nor be shadowed by other packages called ``tools``.
"""
