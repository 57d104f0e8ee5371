"""``hora.spark.common.constants``: Horovod's Spark constants, for programs that reference them.

The intermediate formats (``ARRAY``, ``CUSTOM_SPARSE``, ``NOCHANGE``, ...) are the values of
``metadata[col]['intermediate_format']`` in Horovod's column metadata; hora's own reader keeps
each column's form in the dataset's ``_metadata.json`` (:class:`hora.store.ColumnSpec`).
"""

#: Horovod's HDFS driver name (hora reaches HDFS through pyarrow's libhdfs)
PETASTORM_HDFS_DRIVER = "libhdfs"
#: Horovod printed metrics every this many steps in verbose mode
METRIC_PRINT_FREQUENCY = 100

# intermediate formats of Horovod's column metadata
ARRAY = "array"
CUSTOM_SPARSE = "custom_sparse_format"
NOCHANGE = "nochange"

# what a vector column holds
MIXED_SPARSE_DENSE_VECTOR = "mixed_sparse_dense_vector"
SPARSE_VECTOR = "sparse_vector"
DENSE_VECTOR = "dense_vector"

#: Horovod capped its readers' shuffle buffers at this many GiB in all
TOTAL_BUFFER_MEMORY_CAP_GIB = 4
BYTES_PER_GIB = 1073741824
