package plugin

// LeftoverGroup is leftoverGroup, for the tests of package plugin_test.
const LeftoverGroup = leftoverGroup
