"""What a student looks at: what a run's timeline shows (:mod:`.scene`), the pictures
(:mod:`.plot`), and slider panels and paced replays (:mod:`.widgets`)."""
