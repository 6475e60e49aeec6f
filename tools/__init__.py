"""Research tooling, outside the wheel: `python -m tools.audit` (white-box audits of the private
step), `python -m tools.lira` (offline LiRA), `python -m tools.faults` (fault injection) and the
public-subspace diagnostic script. Run them from a checkout."""
