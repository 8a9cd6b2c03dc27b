//! Does nothing and succeeds: what is left of a run is the host's own cost.

baton_guest::job!(|_info| Ok(()));
