# Installation (docs/operations.md, "Installing"): `cmake --install build
# [--prefix P]` and `cpack -G DEB` (prefix /usr) lay out
#   bin/stserver, bin/stcli                  RUNPATH $ORIGIN/../<libdir>
#   <libdir>/libstclient.so.0, libstembed.so.0, pkgconfig/stclient.pc
#   include/st/*.h                           the public headers
#   share/lua/5.1/st/*.lua                   the Lua client (LuaJIT's path)
#   lib/python3/dist-packages/sharedtensor/  the Python package
#   <sysconfdir>/sharedtensor/config.lua     the default config and its
#   <sysconfdir>/sharedtensor/endpoints/     endpoints (/etc for /usr)
#   share/doc/sharedtensor/                  the docs
#   lib/systemd/system/sharedtensor.service  the unit, with these paths
#   lib/systemd/system/sharedtensor-metrics.{service,timer}  the metrics
#                                            textfile every 15 s
# Files that name installed paths are written at install time, when the
# prefix is known (cmake/install_generated.cmake); the Lua and Python
# clients find the library through one of them (st/libpath.lua,
# sharedtensor/_libpath.py: its path relative to them).
set(ST_PYTHON_INSTALL_DIR "lib/python3/dist-packages" CACHE STRING
    "Where `cmake --install` puts the Python package, relative to the prefix")
set(ST_LUA_INSTALL_DIR "${CMAKE_INSTALL_DATADIR}/lua/5.1" CACHE STRING
    "Where `cmake --install` puts the Lua client modules, relative to the prefix")

install(TARGETS stserver stcli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS stclient stembed LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/st DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/lua/st DESTINATION ${ST_LUA_INSTALL_DIR}
        FILES_MATCHING PATTERN "*.lua")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/sharedtensor DESTINATION ${ST_PYTHON_INSTALL_DIR}
        FILES_MATCHING PATTERN "*.py" PATTERN "_libpath.py" EXCLUDE
        PATTERN "__pycache__" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md")
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(CODE "
  set(ST_SRC \"${PROJECT_SOURCE_DIR}\")
  set(ST_BIN \"${PROJECT_BINARY_DIR}\")
  set(ST_VERSION \"${PROJECT_VERSION}\")
  set(ST_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(ST_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(ST_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(ST_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  set(ST_LUADIR \"${ST_LUA_INSTALL_DIR}\")
  set(ST_PYDIR \"${ST_PYTHON_INSTALL_DIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/install_generated.cmake\")")

# cpack -G DEB: a package with the prefix /usr, staged through DESTDIR so
# that the paths written at install time are the installed ones.
set(CPACK_PACKAGE_NAME "sharedtensor")
set(CPACK_PACKAGE_VENDOR "sharedtensor")
set(CPACK_PACKAGE_CONTACT "sharedtensor maintainers <sharedtensor@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Builds CUDA and CPU tensors once and shares them zero-copy with local processes")
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libev4, libluajit-5.1-2, libmsgpackc2")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3, python3-torch, luajit")
# The binaries and libraries ship stripped; their debug symbols go to a
# separate package, sharedtensor-dbgsym (a .ddeb, found by build id under
# /usr/lib/debug/.build-id), which needs a build type with -g
# (RelWithDebInfo, the default, or Debug).
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
# The config and the endpoints are the operator's: an upgrade keeps edits.
file(GLOB st_endpoint_files RELATIVE ${PROJECT_SOURCE_DIR}/endpoints
     ${PROJECT_SOURCE_DIR}/endpoints/*.lua)
set(st_conffiles "/etc/sharedtensor/config.lua\n")
foreach(f ${st_endpoint_files})
  string(APPEND st_conffiles "/etc/sharedtensor/endpoints/${f}\n")
endforeach()
file(WRITE ${PROJECT_BINARY_DIR}/install/conffiles "${st_conffiles}")
# Maintainer scripts: remove what Python writes into the package's
# directory (__pycache__), so that a remove or a purge leaves nothing.
foreach(script prerm postrm)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/deb/${script}.in
                 ${PROJECT_BINARY_DIR}/install/${script} @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                  GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/install/conffiles"
    "${PROJECT_BINARY_DIR}/install/prerm" "${PROJECT_BINARY_DIR}/install/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
