//! Hayate's mqtt front-end (being moved here from hayate-server; issue 45).
