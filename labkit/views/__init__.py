"""What a student looks at: timelines and outcome maps (:mod:`labkit.views.plot`) and
slider panels and paced replays (:mod:`labkit.views.widgets`)."""
