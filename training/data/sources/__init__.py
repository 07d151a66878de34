"""A user's own labelled data (``python -m training calibrate --data PATH``) as the pipeline's in-memory splits, with
errors a user can act on and a summary to read before any training starts.

Images: a folder of class folders (``root/<class>/*``) or of split folders (``root/{train,val,test}/<class>/*``),
PNG or JPEG files, converted exactly as the server converts a request's image (``models.image_input``, the one rule
both use). Texts: a
CSV / TSV / JSON lines / Parquet file, a folder of ``train.*`` (``val.*``, ``test.*``) files, a ``datasets`` folder
written by ``save_to_disk``, or a hub id ``owner/name``.

Labels are class names or integer indices into the checkpoint's ``id2label`` names. A split that is not given is
carved out of train, seeded and stratified by class. Every split comes out in a seeded random order, so that
``head(n)`` is a fair sample of every class. Every problem with the data is one ``DataError``.

Modules: ``errors`` (``DataError``), ``folders`` (listings), ``labels`` (label resolution), ``splits`` (carving),
``summary`` (``DataSummary``), ``images`` (image folders),
``text_files`` (one CSV / JSON lines / Parquet file) and ``tables`` (text sources).
"""

from models.image_input import IMAGE_CONVERSION, convert_image, image_convert_fields
from training.data.sources.errors import DataError, check_class_count
from training.data.sources.images import load_image_folder, read_image
from training.data.sources.labels import LabelLimit
from training.data.sources.splits import carve_splits
from training.data.sources.summary import DataSummary
from training.data.sources.tables import load_text_table

__all__ = ["IMAGE_CONVERSION", "DataError", "DataSummary", "LabelLimit", "carve_splits", "check_class_count",
           "convert_image", "image_convert_fields", "load_image_folder", "load_text_table", "read_image"]
