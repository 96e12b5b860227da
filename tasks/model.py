"""Where models logged before meta format 2 find their pyfunc class (they pickled ``tasks.model.ImageClassifierPyfunc``)."""

from tasks.models.loading import ImageClassifierPyfunc

__all__ = ["ImageClassifierPyfunc"]
