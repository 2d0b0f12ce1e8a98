"""Pure planners: (declared spec, observed facts) -> desired state. No I/O, no pyinfra imports."""
