"""Evolutionary search over candidate kernels for one op on one target.

    database    candidates, lineages, duplicates, checkpointable state
    selection   lineage by exploration deficit, UCB parent, inspirations, annealing
    controller  the loop: budget, concurrency per device, chunks, checkpoints, early stop
    results     best.py, report.json, the lineage graph, promotion to kernels/
"""
