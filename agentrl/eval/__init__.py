"""Evaluation: metrics (:mod:`agentrl.eval.metrics`) and the policy runner
(:mod:`agentrl.eval.runner`).

Importing this package imports nothing heavy; import the submodules you need.
"""
