"""The champion at work: batch scoring, REST serving, feedback, monitoring and explanations."""
