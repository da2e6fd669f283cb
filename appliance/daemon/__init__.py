"""The composition root: the one place that builds the daemon's services (compose.py),
wires them to each other (wiring.py), starts and stops them in order (lifecycle.py) and
puts the HTTP app on top (app.py)."""
