# cmake --install: libraries, public headers, an exported CMake package (find_package(moeinfer))
# and a pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS moeinfer moeinfer_static EXPORT moeinferTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/moeinfer/moeinfer.h include/moeinfer/moeinfer.hpp
              "${PROJECT_BINARY_DIR}/include/moeinfer/moeinfer_version.h"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/moeinfer)

set(MOEINFER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/moeinfer)
install(EXPORT moeinferTargets NAMESPACE moeinfer:: DESTINATION ${MOEINFER_CMAKE_DIR})
configure_package_config_file(cmake/moeinferConfig.cmake.in
  "${PROJECT_BINARY_DIR}/moeinferConfig.cmake" INSTALL_DESTINATION ${MOEINFER_CMAKE_DIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/moeinferConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/moeinferConfig.cmake" "${PROJECT_BINARY_DIR}/moeinferConfigVersion.cmake"
        DESTINATION ${MOEINFER_CMAKE_DIR})

set(MOEINFER_PC_REQUIRES_PRIVATE "tbb")
configure_file(cmake/moeinfer.pc.in "${PROJECT_BINARY_DIR}/moeinfer.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/moeinfer.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
