"""What people and the operator use on a stage's Redis data from outside its workers: read it (inspection,
queue_stats), repair it (repair and its scripts), record who did (audit) and move it to a newer key layout
(migrate). The worker runtime never imports this package."""
