# Include roots, one per top-level folder, so that the folders' layering
# is checked by the compiler: code includes "schema/x.h", "server/x.h",
# "worker/x.h" and so on, and the directory that resolves "FOLDER/..." is
# given only to the folder's own library and to what links it. An include
# from server/ into worker/ (or the reverse) then fails to compile.
#
#   tether_include_root(TARGET FOLDER SCOPE)
#
# The root is build/include/FOLDER, holding one link, FOLDER, to the source
# folder. SCOPE: PUBLIC for a folder's library (what links it may include
# its headers), PRIVATE for programs and tests.
function(tether_include_root target folder scope)
  set(root ${CMAKE_BINARY_DIR}/include/${folder})
  if(NOT IS_SYMLINK ${root}/${folder})
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${folder} ${root}/${folder} SYMBOLIC)
  endif()
  target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${root}>)
endfunction()
