# The Debian package (tools/package): one package, `tether`, made by CPack's
# DEB generator from the build tree, with everything a host needs to run
# tether without building it:
#   /usr/bin/                      tether-server, tether-worker, tether-up,
#                                  tether-client, tether-ckpt
#   /usr/lib/libtether_cuda.so     the CUDA backend module, where this build
#                                  has one (the loader dlopens it by name)
#   /usr/include/tether/, /usr/lib/libtether_client.so*,
#   /usr/lib/cmake/tether/         the C++ SDK (component sdk, as installed
#                                  by `cmake --install --component sdk`)
#   /usr/lib/python3/dist-packages/tether/   the Python package, where this
#                                  build has one (the extension and its .py)
# The dashboard's page is compiled into tether-server (server/: embed.cmake),
# so no web files are shipped. Benchmarks, tether-gen-sparse and the test
# programs are not installed.
# Included from the top-level CMakeLists.txt after every target is defined.

# --- install rules for the programs (component runtime) ---
# `cmake --install build/release --prefix P` installs them in P/bin too.
install(TARGETS tether-server tether-worker tether-up tether-client
  tether-ckpt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
if(TARGET tether_cuda)
  # Not next to the programs (bin/ is for programs): on the loader's path,
  # where worker/cuda_loader.cc looks after the program's own directory.
  install(TARGETS tether_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT runtime)
endif()

# --- the Python package where Debian's python3 finds it ---
# The python component installs into lib/pythonX.Y/dist-packages, right for
# the default prefix /usr/local but not searched under /usr: the package
# has its own copy, in a component only a package (or an explicit
# --component debian_python) installs.
set(TETHER_DEB_COMPONENTS runtime sdk)
if(TARGET tether_python)
  set(TETHER_DEB_PYTHON_DIR lib/python3/dist-packages/tether)
  file(GLOB TETHER_DEB_PY_SOURCES CONFIGURE_DEPENDS
       ${CMAKE_SOURCE_DIR}/worker/python/tether/*.py)
  install(TARGETS tether_python LIBRARY DESTINATION ${TETHER_DEB_PYTHON_DIR}
    COMPONENT debian_python EXCLUDE_FROM_ALL)
  install(FILES ${TETHER_DEB_PY_SOURCES} DESTINATION ${TETHER_DEB_PYTHON_DIR}
    COMPONENT debian_python EXCLUDE_FROM_ALL)
  list(APPEND TETHER_DEB_COMPONENTS debian_python)
endif()

# --- CPack ---
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME tether)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR tether)
set(TETHER_PACKAGE_MAINTAINER "tether maintainers <tether@invalid>" CACHE
    STRING "The Maintainer field of the Debian package")
set(CPACK_PACKAGE_CONTACT ${TETHER_PACKAGE_MAINTAINER})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "sharded, staleness-bounded parameter server")
# The description's body (CPack puts the summary above it).
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "tether-server (a parameter shard with a live dashboard), tether-worker,
tether-up (a local cluster in one command), tether-client and tether-ckpt;
the C++ client SDK (headers, libtether_client.so, CMake package) and the
tether Python package.")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# The package holds only these components, each installed with the prefix
# /usr: not the python one (see above), nor anything unnamed.
set(CPACK_INSTALL_CMAKE_PROJECTS)
foreach(component IN LISTS TETHER_DEB_COMPONENTS)
  list(APPEND CPACK_INSTALL_CMAKE_PROJECTS
       ${CMAKE_BINARY_DIR} ${PROJECT_NAME} ${component} /)
endforeach()
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
# tether_0.1.0_amd64.deb
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# A release build carries debug info: the package's programs are stripped.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_THREADS 2)

# Depends: the packages of the shared libraries the programs, the SDK
# library and the modules link (RocksDB, Boost.JSON, oneDNN, OpenSSL, ...),
# as dpkg-shlibdeps (dpkg-dev) finds them. Libraries no package owns (a CUDA
# toolkit in /usr/local/cuda, which libtether_cuda.so links) are left out:
# the CUDA module is optional and its loader says what is missing.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The Python package: its extension is built for one Python version, and
# `import tether` needs NumPy; tether.torch, tether.worker and
# `tether-up --python-model` need PyTorch. Nothing of it is needed by the
# programs or the SDK (a shard host needs no Python), hence Recommends, and
# PyTorch (large, and only for training from Python) as Suggests.
if(TARGET tether_python)
  set(py ${Python_VERSION_MAJOR}.${Python_VERSION_MINOR})
  math(EXPR py_next "${Python_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS
      "python3 (>= ${py}~), python3 (<< ${Python_VERSION_MAJOR}.${py_next}), python3-numpy")
  set(CPACK_DEBIAN_PACKAGE_SUGGESTS python3-torch)
  # Importing as root writes __pycache__ next to the files: remove it with
  # them.
  set(TETHER_DEB_PRERM ${CMAKE_BINARY_DIR}/debian/prerm)
  file(CONFIGURE OUTPUT ${TETHER_DEB_PRERM} CONTENT
"#!/bin/sh
set -e
rm -rf /usr/${TETHER_DEB_PYTHON_DIR}/__pycache__
")
  set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${TETHER_DEB_PRERM})
  set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
endif()

include(CPack)
