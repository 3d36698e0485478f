//! oxgen-runtime: The backend seam: the Session trait every backend implements
