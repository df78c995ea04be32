# Run by `cmake --install` / cpack (install(CODE) in install.cmake), when
# the prefix is known: writes the files that name installed paths. Inputs:
# CMAKE_INSTALL_PREFIX (the install's), ST_SRC (source dir), ST_BIN (build
# dir), ST_LIBDIR, ST_BINDIR, ST_INCLUDEDIR, ST_DOCDIR, ST_LUADIR, ST_PYDIR
# (relative to the prefix), ST_VERSION. file(INSTALL) applies $DESTDIR.
set(p "${CMAKE_INSTALL_PREFIX}")
# GNUInstallDirs' rule for sysconfdir: /etc for the prefix /usr.
if(p STREQUAL "/usr")
  set(etc "/etc/sharedtensor")
else()
  set(etc "${p}/etc/sharedtensor")
endif()
set(out "${ST_BIN}/install")
file(MAKE_DIRECTORY "${out}")

# stclient.pc; a prefix outside the loader's default paths gets an rpath,
# so a consumer built with `pkg-config --libs stclient` runs as it is.
set(libdir "${p}/${ST_LIBDIR}")
set(rpath "")
if(NOT libdir MATCHES "^/usr/lib(/|$)|^/lib(/|$)")
  set(rpath " -Wl,-rpath,\${libdir}")
endif()
file(WRITE "${out}/stclient.pc"
  "# pkg-config file of libstclient, the sharedtensor C client (docs/client.md).\n"
  "prefix=${p}\nlibdir=${libdir}\nincludedir=${p}/${ST_INCLUDEDIR}\n\n"
  "Name: stclient\n"
  "Description: sharedtensor client: zero-copy tensors from a local stserver\n"
  "Version: ${ST_VERSION}\nRequires.private: msgpack\n"
  "Cflags: -I\${includedir}\nLibs: -L\${libdir} -lstclient${rpath}\n")
file(INSTALL DESTINATION "${libdir}/pkgconfig" TYPE FILE FILES "${out}/stclient.pc")

# Where the Lua and Python clients find the libraries: the library
# directory, relative to them.
file(RELATIVE_PATH lua_rel "${p}/${ST_LUADIR}/st" "${libdir}")
file(RELATIVE_PATH py_rel "${p}/${ST_PYDIR}/sharedtensor" "${libdir}")
file(WRITE "${out}/libpath.lua"
  "-- Written by `cmake --install`: the library directory, relative to this file.\n"
  "return \"${lua_rel}\"\n")
file(WRITE "${out}/_libpath.py"
  "# Written by `cmake --install`: the library directory, relative to this file.\n"
  "LIBDIR = \"${py_rel}\"\n")
file(INSTALL DESTINATION "${p}/${ST_LUADIR}/st" TYPE FILE FILES "${out}/libpath.lua")
file(INSTALL DESTINATION "${p}/${ST_PYDIR}/sharedtensor" TYPE FILE FILES "${out}/_libpath.py")

# The default config and endpoints: an installed stserver started without
# --config reads this config (src/server/install_paths.c).
file(INSTALL DESTINATION "${etc}" TYPE FILE FILES "${ST_SRC}/config.lua")
file(GLOB endpoint_files "${ST_SRC}/endpoints/*.lua")
file(INSTALL DESTINATION "${etc}/endpoints" TYPE FILE FILES ${endpoint_files})

# The systemd unit, naming the installed binary, config and docs.
file(READ "${ST_SRC}/docs/sharedtensor.service" unit)
string(REPLACE "/usr/bin/stserver" "${p}/${ST_BINDIR}/stserver" unit "${unit}")
string(REPLACE "/etc/sharedtensor" "${etc}" unit "${unit}")
string(REPLACE "/usr/share/doc/sharedtensor" "${p}/${ST_DOCDIR}" unit "${unit}")
file(WRITE "${out}/sharedtensor.service" "${unit}")
file(INSTALL DESTINATION "${p}/lib/systemd/system" TYPE FILE
     FILES "${out}/sharedtensor.service")
# The metrics timer and its service (docs/operations.md, "Monitoring"),
# naming the installed stcli.
foreach(u sharedtensor-metrics.service sharedtensor-metrics.timer)
  file(READ "${ST_SRC}/docs/${u}" unit)
  string(REPLACE "/usr/bin/stcli" "${p}/${ST_BINDIR}/stcli" unit "${unit}")
  string(REPLACE "/usr/share/doc/sharedtensor" "${p}/${ST_DOCDIR}" unit "${unit}")
  file(WRITE "${out}/${u}" "${unit}")
  file(INSTALL DESTINATION "${p}/lib/systemd/system" TYPE FILE FILES "${out}/${u}")
endforeach()
