"""Datasets for MaxK-GNN experiments behind one loader: :func:`load_dataset`.

Real datasets (read offline from a data root; nothing is downloaded here):

- ``reddit``, ``flickr``, ``yelp`` -- DGL's dataset classes (``raw_dir`` = the data root);
- ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-proteins`` -- OGB's ``DglNodePropPredDataset``;
  proteins gets node features = sum of its incoming edges' 8 features, 112 binary tasks;
- ``cora``, ``citeseer``, ``pubmed`` -- DGL's planetoid classes (the standard public split);
- ``ogbn-papers100M`` -- OGB's files read without OGB, a chunk at a time, its graph a
  ``DeviceGraph`` built on the training device (no DGL graph on the host); its files are
  checked as the others' are, its edges' node ids as they are read.

Generators owned by the package (no files needed, reproducible from ``seed``):

- ``planted`` -- a contextual stochastic block model: planted classes, edges inside a class
  with probability ``p_in`` and across with ``p_out`` (or equivalently ``mean_degree`` and
  ``homophily``), and node features = ``feature_snr`` x (class mean) + N(0, I) noise;
- ``powerlaw`` -- a graph of chosen size and mean degree with log-normal in-degrees
  (:func:`power_law_csr`), for speed work. Its features and labels are RANDOM: accuracy on it
  is chance level and means nothing;
- ``papers100m-sized`` -- ogbn-papers100M's shape by default (111M nodes, 1.6B edges), its
  graph a ``DeviceGraph`` built on the training device, labels planted by a rule over each
  node's and its in-neighbours' features.

The data root is the ``root`` argument, else the environment variable ``DGL_MAXK_DATA``, else
``./data``. A missing dataset raises :class:`DatasetNotFound` at once, naming the files to
place and where (:func:`layout`); OGB's interactive y/N prompt and download are never reached.
Before DGL or OGB processes the raw files, each is read by its format and checked against
what the dataset's other files imply (sizes, counts, index ranges; an OGB split on every
load): a file that is there but damaged raises :class:`DatasetError` naming it and the way on,
and never trains. DGL and OGB write processed caches next to the raw files: when that
directory is not writable, the raw files are first copied to ``DGL_MAXK_CACHE`` (default: a
``dgl_maxk_cache`` folder in the system temp directory). A processed cache is checked
against the size and digest recorded when it was written (``dgl_maxk_processed.json``), or,
written without dgl_maxk, read by DGL in a child process first: a damaged one raises
:class:`DatasetError` naming it (delete it, and the next load rebuilds it), and never
reaches DGL's reader, which can crash the process on a cut file.

Modules, each importing only those before it: ``dataset`` (the Dataset type and errors),
``params`` (parameter ranges), ``generators``, ``files`` (data root, layouts, writable copy),
``formats`` (reading each file format, finding a damaged file), ``checks`` (what a dataset's
raw files must agree on), ``processed`` (the record of a processed cache), ``unreadable``
(the errors naming a damaged file), ``loaders``, ``device_graphs`` (CSR graphs built on a
device a chunk at a time), ``papers`` (the two papers100M-sized datasets), ``registry``
(names, checks of parameters, ``load_dataset``).
"""
from .dataset import Dataset, DatasetError, DatasetNotFound
from .files import data_root, dgl_layout, ogb_layout
from .generators import planted_partition, power_law_csr, power_law_graph
from .registry import DATASETS, canonical_name, check_params, dataset_names, layout, load_dataset

__all__ = ["Dataset", "DatasetError", "DatasetNotFound", "load_dataset", "dataset_names",
           "DATASETS", "data_root", "layout", "check_params", "canonical_name",
           "planted_partition", "power_law_graph", "power_law_csr", "dgl_layout",
           "ogb_layout"]
