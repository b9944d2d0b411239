"""The course as files: what a student gets (:mod:`labkit.course.release`)."""
